"""Workflows for hardening_workflows tests."""

from __future__ import annotations
