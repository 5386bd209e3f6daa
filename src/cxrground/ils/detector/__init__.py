"""The VinDr-CXR lesion detector of ILS §8, made here: dataset preparation, training and evaluation.

- :mod:`~cxrground.ils.detector.vindr`: the annotations file, the class mapping, reader fusion, the split;
- :mod:`~cxrground.ils.detector.prepare`: letterboxed films, YOLO labels and the ultralytics dataset YAML;
- :mod:`~cxrground.ils.detector.train`: ``cxrground detector train`` (ultralytics, offline, resumable);
- :mod:`~cxrground.ils.detector.evaluate`: ``cxrground detector evaluate`` (mAP@0.5 per class, the ILS view);
- :mod:`~cxrground.ils.detector.synthetic`: the synthetic cohort's lesions as a VinDr-CXR file (test data).

The trained weights are what ``ils build --detector yolo --detector-opt weights_path=...`` reads
(:class:`~cxrground.ils.spatial.boxes.YOLOBoxDetector`). ultralytics and torch are imported only when training
or predicting.
"""
