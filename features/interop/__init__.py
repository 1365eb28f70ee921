"""Interop: a store's features to and from the formats of other codebases (``docs/features.md``).

``export`` writes a finished store as VSE++/SCAN precomp ``{split}_ims.npy`` (global or region rows), one
HDF5 file, or a bottom-up-attention TSV; ``imports`` reads precomp ``.npy``, SCAN region precomp, the
bottom-up-attention TSV or such an HDF5 file into a store of a prepared dataset; ``region_formats`` holds the
readers and writers of the region formats (SCAN precomp, BUTD TSV).
"""
