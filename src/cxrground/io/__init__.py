"""Images and masks I/O: CXR images (PNG, JPEG, DICOM), working-size transforms, mask codecs."""
