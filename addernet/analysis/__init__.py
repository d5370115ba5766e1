"""Analyses of the models: multiplication/addition counts and energy estimates."""

from .op_count import count_model_ops, count_ops, format_report

__all__ = ["count_ops", "count_model_ops", "format_report"]
