"""Helpers of the package: its logger and argument checks."""
