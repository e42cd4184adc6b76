"""Calc-X data: the row schema, parquet/jsonl files with row validation, a problem generator."""
