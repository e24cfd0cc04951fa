"""Real parsers the tests use to check what FlowForge prints (see mermaid_parser.py)."""
