"""Attacks an outsider can make, each driven the way they would drive it."""
