"""How lesions are found on a film: the stage between anatomy geometry and ILS generation.

- :mod:`~cxrground.lesions.lesion_sim`: lesions inserted into normal films with exact pixel truth.
- :mod:`~cxrground.lesions.normative`: the per-position normal-lung model and its z-map
  (recipe: :mod:`~cxrground.lesions.normative_fit`).
- :mod:`~cxrground.lesions.zone_features`, :mod:`~cxrground.lesions.zone_classifier`: the zone reader's features
  and logistic model (recipes: :mod:`~cxrground.lesions.zone_sim_fit` on simulated lesions,
  :mod:`~cxrground.lesions.zone_fit` on the user's labelled films).
- :mod:`~cxrground.lesions.segmenter`: the learned lesion segmenter ``lesion_unet_v1`` (recipe:
  :mod:`~cxrground.lesions.segmenter_fit`) and :mod:`~cxrground.lesions.lesion_zones`, its zone reading.
- :mod:`~cxrground.lesions.zone_prior`: the position-prior zone readers (film severity placed by a position prior):
  ``zone_prior_v1``, and ``zone_prior_v2`` / ``zone_prior_v3`` (the default of ``anatomy zones``), whose film
  severity comes from :mod:`~cxrground.lesions.zone_severity`.
- :mod:`~cxrground.lesions.zones`: ``anatomy zones``, six lung zones read as normal or abnormal.

Shipped statistics and weights live in ``cxrground/lesions/weights/``. This stage imports from anatomy, io,
vocab and datasets only; ILS generation imports from it.
"""
