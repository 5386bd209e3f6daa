"""Anatomy geometry from lung (and heart) masks: ILS location labels, CheXpercept zones and
sub-regions, overlap records and the cardiothoracic ratio. Pure numpy/scipy."""

from cxrground.anatomy.ils_locations import ils_location_masks, location_union, lung_zone_bands

__all__ = ["ils_location_masks", "location_union", "lung_zone_bands"]
