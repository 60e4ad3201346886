"""The PyMC step methods: thin adapters from settings to the racing and model layers."""
