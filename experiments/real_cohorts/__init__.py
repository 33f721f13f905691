"""Public clinical cohorts as medjax cohorts (issue 34): `cohorts` converts them."""
