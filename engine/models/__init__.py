"""Model code: the target wrapper and the DSpark / DFlash drafters."""
