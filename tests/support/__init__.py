"""What the tests share: fixtures' writers, reference implementations the fast paths are
tested against, drivers run in other interpreters, receivers. Imported one way only:
``from tests.support.MODULE import NAME`` (``tests/unit/test_layers``-style checks need no
helper; a test file never imports another test file)."""
