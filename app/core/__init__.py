"""The vocabulary every layer shares: the states, the errors, the clock, the
configuration's schema, and the checks of names and values. Imports
nothing of Jobdeck's above it."""
