"""Hand-checked tricky report sentences with the findings a careful reader takes from them.

Written for these tests from common chest-radiograph phrasing (not copied from any data set). Each row:
``(kind, sentence, expected)`` with ``expected`` a list of ``(lesion or lower-cased non-target entity,
assertion, reported-location labels)`` in the order the phrases appear. Shared by the rule-structurer test
(``test_structure_tricky.py``) and the LLM-prompt test (``test_structure_llm_tricky.py``).

Conventions (ILS.md §7, the lexicon of ``reports/structure/lexicon.py``): only explicit negation is absent;
every hedge is uncertain, never absent; alternatives are uncertain under the default alternatives policy;
a lung finding without a location phrase maps to both lungs; cardiomegaly maps to ``heart``; a historical
mention ("history of pneumonia") is no finding; a finding named only as the object of a recommendation to
exclude it is uncertain.
"""

from __future__ import annotations

RL, LL = "right lung", "left lung"
RB, LB, RM, LM = "right lung base", "left lung base", "right mid zone lung", "left mid zone lung"
RU, LU, RA, LA = "right upper zone lung", "left upper zone lung", "right apical zone lung", "left apical zone lung"
BOTH = (RL, LL)
HEART = "heart"

Expected = list[tuple[str, str, tuple[str, ...]]]

TRICKY: list[tuple[str, str, Expected]] = [
    # --- negation ---------------------------------------------------------------------------------------------
    ("negation", "No evidence of focal consolidation, pleural effusion or pneumothorax.",
     [("consolidation", "absent", BOTH), ("effusion", "absent", BOTH), ("pneumothorax", "absent", BOTH)]),
    ("negation", "The lungs are clear without focal airspace disease.", [("opacity", "absent", BOTH)]),
    ("negation", "There is no longer evidence of pulmonary edema.", [("edema", "absent", BOTH)]),
    ("negation", "The previously seen left lower lobe opacity has resolved.", [("opacity", "absent", (LB,))]),
    ("negation", "The cardiac silhouette is not enlarged.", [("cardiomegaly", "absent", (HEART,))]),
    ("negation", "No pneumothorax, but there is a small right pleural effusion.",
     [("pneumothorax", "absent", BOTH), ("effusion", "present", (RL,))]),
    ("negation", "No change in the moderate left pleural effusion.", [("effusion", "present", (LL,))]),
    ("negation", "Pleural effusions are not seen on the lateral view.", [("effusion", "absent", BOTH)]),
    # a negated list ends at a bare comma that opens a new item; it goes on when the list ends with "or"
    ("negation", "No pneumothorax, small right pleural effusion.",
     [("pneumothorax", "absent", BOTH), ("effusion", "present", (RL,))]),
    ("negation", "No pneumothorax, large effusion, or consolidation.",
     [("pneumothorax", "absent", BOTH), ("effusion", "absent", BOTH), ("consolidation", "absent", BOTH)]),
    ("negation", "Interval clearing of the right basilar opacity.", [("opacity", "absent", (RB,))]),
    # a post-negation does not reach back across a comma that opens a new subject
    ("negation", "Cardiac silhouette is enlarged, lung volumes within normal limits.",
     [("cardiomegaly", "present", (HEART,))]),
    # --- hedges -----------------------------------------------------------------------------------------------
    ("hedge", "Left lower lobe opacity raises concern for pneumonia.", [("pneumonia", "uncertain", (LB,))]),
    ("hedge", "Please correlate clinically for pneumonia.", [("pneumonia", "uncertain", BOTH)]),
    ("hedge", "Aspiration pneumonia would be a consideration in the appropriate clinical setting.",
     [("pneumonia", "uncertain", BOTH)]),
    ("hedge", "A small left pleural effusion is difficult to completely exclude.", [("effusion", "uncertain", (LL,))]),
    ("hedge", "Difficult to completely exclude a trace right pleural effusion.", [("effusion", "uncertain", (RL,))]),
    ("hedge", "Subtle right basilar opacity may represent early pneumonia.", [("pneumonia", "uncertain", (RB,))]),
    ("hedge", "Findings are suggestive of mild interstitial edema.", [("edema", "uncertain", BOTH)]),
    ("hedge", "Pneumonia is unlikely.", [("pneumonia", "uncertain", BOTH)]),
    ("hedge", "Mild pulmonary edema cannot be entirely excluded.", [("edema", "uncertain", BOTH)]),
    ("hedge", "Possible small left effusion with adjacent atelectasis.",
     [("effusion", "uncertain", (LL,)), ("atelectasis", "uncertain", (LL,))]),
    ("hedge", "Borderline cardiomegaly.", [("cardiomegaly", "uncertain", (HEART,))]),
    ("hedge", "The cardiac silhouette is borderline in size.", [("cardiomegaly", "uncertain", (HEART,))]),
    ("hedge", "Patchy left basilar opacity, favor atelectasis.", [("atelectasis", "uncertain", (LB,))]),
    ("hedge", "Atelectasis is more likely than pneumonia.",
     [("atelectasis", "uncertain", BOTH), ("pneumonia", "uncertain", BOTH)]),
    ("hedge", "Question right upper lobe pneumonia.", [("pneumonia", "uncertain", (RU,))]),
    # a hedged explanation of a finding still states the finding
    ("hedge", "Shallow inspiration probably accounts for the bibasilar opacities.", [("opacity", "present", (RB, LB))]),
    # --- alternatives (default policy: uncertain) -------------------------------------------------------------
    ("alternatives", "Atelectasis or scarring at the right base.",
     [("atelectasis", "uncertain", (RB,)), ("scarring", "uncertain", (RB,))]),
    ("alternatives", "Right basilar atelectasis/infiltrate.",
     [("atelectasis", "uncertain", (RB,)), ("opacity", "uncertain", (RB,))]),
    ("alternatives", "Left basilar opacity may reflect atelectasis or aspiration.",
     [("atelectasis", "uncertain", (LB,)), ("pneumonia", "uncertain", (LB,))]),
    ("alternatives", "Bibasilar atelectasis versus small amount of fluid.", [("atelectasis", "uncertain", (RB, LB))]),
    ("alternatives", "Pneumonia versus atelectasis in the left lower lobe.",
     [("pneumonia", "uncertain", (LB,)), ("atelectasis", "uncertain", (LB,))]),
    # a series comma list that ends with "or" is one group of alternatives (sharing the location)
    ("alternatives", "Scarring, atelectasis, or pneumonia in the lingula.",
     [("scarring", "uncertain", (LM,)), ("atelectasis", "uncertain", (LM,)), ("pneumonia", "uncertain", (LM,))]),
    ("alternatives", "Left basilar opacity may reflect atelectasis, aspiration, or early pneumonia.",
     [("atelectasis", "uncertain", (LB,)), ("pneumonia", "uncertain", (LB,)), ("pneumonia", "uncertain", (LB,))]),
    # --- laterality -------------------------------------------------------------------------------------------
    ("laterality", "Small right and moderate left pleural effusions.", [("effusion", "present", (RL, LL))]),
    ("laterality", "Left greater than right basilar atelectasis.", [("atelectasis", "present", (RB, LB))]),
    ("laterality", "Consolidation in the right upper lobe and lingula.", [("consolidation", "present", (RU, LM))]),
    ("laterality", "Patchy opacity in the right middle lobe, left lower lobe is clear.",
     [("opacity", "present", (RM,))]),
    ("laterality", "Small left pleural effusion. The effusion is unchanged in size.",
     [("effusion", "present", (LL,)), ("effusion", "present", (LL,))]),
    ("laterality", "Right lower lobe pneumonia. Pneumonia has progressed since the prior study.",
     [("pneumonia", "present", (RB,)), ("pneumonia", "present", (RB,))]),
    ("laterality", "Elevated left hemidiaphragm with retrocardiac atelectasis.", [("atelectasis", "present", (LB,))]),
    ("laterality", "Volume loss in the left hemithorax.", [("volume loss", "present", (LL,))]),
    ("laterality", "Subsegmental atelectasis behind the heart.", [("atelectasis", "present", (LB,))]),
    ("laterality", "Moderate left pleural effusion with compressive atelectasis.",
     [("effusion", "present", (LL,)), ("atelectasis", "present", (LL,))]),
    # --- history ----------------------------------------------------------------------------------------------
    ("history", "History of pneumonia.", []),
    ("history", "Patient with a history of congestive heart failure, now with bilateral pleural effusions.",
     [("effusion", "present", BOTH)]),
    ("history", "Prior right lower lobe pneumonia has cleared.", [("pneumonia", "absent", (RB,))]),
    ("history", "Previously noted left pleural effusion is unchanged.", [("effusion", "present", (LL,))]),
    # --- recommendations --------------------------------------------------------------------------------------
    ("recommendation", "Follow-up radiographs are recommended to document resolution of the right lower lobe "
                       "pneumonia.", [("pneumonia", "present", (RB,))]),
    ("recommendation", "CT is recommended to exclude an underlying mass.", [("mass", "uncertain", BOTH)]),
    ("recommendation", "Repeat radiograph after diuresis to assess for underlying consolidation.",
     [("consolidation", "uncertain", BOTH)]),
    ("recommendation", "Recommend CT for further evaluation of the right upper lobe nodule.",
     [("nodule", "present", (RU,))]),
    # --- sentence splitting -----------------------------------------------------------------------------------
    ("splitting", "No pleural effusion . Mild cardiomegaly .",
     [("effusion", "absent", BOTH), ("cardiomegaly", "present", (HEART,))]),
]

#: Rows whose expectation changes under the ``present`` alternatives policy (same order of findings).
ALTERNATIVES_PRESENT: dict[str, Expected] = {
    "Atelectasis or scarring at the right base.":
        [("atelectasis", "present", (RB,)), ("scarring", "present", (RB,))],
    "Right basilar atelectasis/infiltrate.": [("atelectasis", "present", (RB,)), ("opacity", "present", (RB,))],
    "Pneumonia versus atelectasis in the left lower lobe.":
        [("pneumonia", "present", (LB,)), ("atelectasis", "present", (LB,))],
    # hedged by "may reflect" whatever the policy; "versus" with only one finding stays a hedge
    "Left basilar opacity may reflect atelectasis or aspiration.":
        [("atelectasis", "uncertain", (LB,)), ("pneumonia", "uncertain", (LB,))],
    "Bibasilar atelectasis versus small amount of fluid.": [("atelectasis", "uncertain", (RB, LB))],
    "Scarring, atelectasis, or pneumonia in the lingula.":
        [("scarring", "present", (LM,)), ("atelectasis", "present", (LM,)), ("pneumonia", "present", (LM,))],
    "Left basilar opacity may reflect atelectasis, aspiration, or early pneumonia.":
        [("atelectasis", "uncertain", (LB,)), ("pneumonia", "uncertain", (LB,)), ("pneumonia", "uncertain", (LB,))],
}

#: Phrases that share a word with a lesion's phrase but name something else (rule lexicon only: the LLM prompt
#: carries no word list for them). Same row format as :data:`TRICKY`; non-target entities lower-cased.
LOOKALIKES: list[tuple[str, str, Expected]] = [
    ("lookalike", "Soft tissue edema along the left chest wall.", [("soft tissue edema", "present", ())]),
    ("lookalike", "Compression collapse of a lower thoracic vertebral body.",
     [("compression collapse", "present", ())]),
    ("lookalike", "Radiation fibrosis in the left upper lobe.", [("radiation fibrosis", "present", (LU,))]),
    ("lookalike", "Radiation pneumonitis is not excluded.", [("radiation pneumonitis", "uncertain", BOTH)]),
    ("lookalike", "Low lung volumes with bronchovascular crowding.", [("bronchovascular crowding", "present", BOTH)]),
]
