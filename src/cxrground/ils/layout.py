"""The on-disk layout of an ILS dataset folder: the file and folder names every reader and writer shares."""

from __future__ import annotations

from typing import Final

__all__ = ["DATASET_FILE", "DATASET_HELP", "MASK_DIR", "UNITS_DIR"]

#: The released MIMIC-ILS JSON (splits → studies → instruction-answer pairs).
DATASET_FILE: Final[str] = "mimic_ils_instruction_answer.json"
#: What a reader of a dataset accepts, in words (help text of the options that name a dataset).
DATASET_HELP: Final[str] = ("ILS dataset folder (mimic_ils_instruction_answer.json + lesion_mask/) or the JSON "
                            "file.")
#: Lesion mask PNGs, ``lesion_mask/s{study}/s{study}_{lesion}_{k}.png``; ``seg_mask_path`` is relative to it.
MASK_DIR: Final[str] = "lesion_mask"
#: One finished work unit per study (``units/{study}.json``), written last and atomically by the build.
UNITS_DIR: Final[str] = "units"
