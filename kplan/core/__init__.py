"""The bottom layer: vocabulary every other layer may import (errors, files, checks, precision)."""
