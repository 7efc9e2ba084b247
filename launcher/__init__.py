"""Host-side helpers of run.py: module images and the validator container. No torch here."""
