"""What tests of every folder share that is not a pytest fixture plugin (``tests/plugins``):
waiting for a condition (``waiting``), and the workflows and fakes several modules use."""
