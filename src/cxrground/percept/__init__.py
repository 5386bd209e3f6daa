"""CheXpercept benchmark generation (CHEXPERCEPT.md): cases, deformations, distractors, rendering, files."""
