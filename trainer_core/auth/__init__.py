"""Who may do what: roles, actors and their rights (access).
"""
