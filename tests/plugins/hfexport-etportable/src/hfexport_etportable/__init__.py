"""Placeholder: filled in by the ExecuTorch backend work."""
