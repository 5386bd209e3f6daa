"""Model training and ILS models. Training code lives here, after the data sources it reads
(``cxrground.datasets``): the lung U-Net recipe (:mod:`.lung_unet`) so far."""
