"""Presentation: console tables and self-contained HTML reports."""
