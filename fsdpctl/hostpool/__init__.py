"""Which hosts a run uses: the profile's hosts, a spare in the place of each excluded one, and the
exclusions remembered per profile on this machine (never by rewriting the user's profile file)."""
