"""ILS dataset generation (ILS.md §5-§12): reports + images -> MIMIC-ILS instruction-answer pairs."""
