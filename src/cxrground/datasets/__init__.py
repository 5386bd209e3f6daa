"""Data sources: the synthetic cohort, the shared real-data pack, a user's own folder."""
