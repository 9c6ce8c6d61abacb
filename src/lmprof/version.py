"""The package version, in the bottom layer so the run record can name it without importing the API."""

__version__ = "0.1.0"
