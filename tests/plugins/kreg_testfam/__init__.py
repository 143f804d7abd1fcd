"""A test-only kreg family ("testfam"), installed by the tests through a real entry point."""
