"""The plan's HTML report: every value with its source, and the plots its evidence asks for."""
