"""Workflows for zombie_workflows tests."""

from __future__ import annotations
