"""Plans: validation, dispatch and launch (no device code). One module per op family."""
