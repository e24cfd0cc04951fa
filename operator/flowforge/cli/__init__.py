"""The ``flowforge`` command line (also usable as ``kubectl flowforge``)."""
