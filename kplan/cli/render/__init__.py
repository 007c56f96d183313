"""Terminal rendering (rich). The only place rich is imported; one module per command group."""
