"""End to end: potato."""
