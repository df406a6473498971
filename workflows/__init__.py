"""Argo Workflows (Hera) template, submit CLI and local DAG runner."""
