"""`gateway eval`: evaluating models and coding tools on the team's own tasks. So far the
sandbox that runs a model's solution and a task's hidden tests (`sandbox`)."""
