"""One module per CLI command group; each is thin and delegates to the library."""
