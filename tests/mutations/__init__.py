"""The protocol's guards as mutations, and the script that checks the tests catch each one."""
