"""Tools for flow authors: cases played on a throwaway engine, folders applied."""
