"""The command line: parse flags, call one application function, render."""
