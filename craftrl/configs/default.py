"""The default task: Crafter "kill cows" with the default recurrent CNN, sized for a 2-core laptop.

The same three names a MineStudio config module exports. Keys left out of ``online_dict`` take the schema
defaults (docs/config.md), which are chosen for this task.
"""


def env_generator():
    from craftrl.envs import make

    return make("crafter/cows")


def policy_generator():
    from craftrl.policies import default_policy_generator

    return default_policy_generator()


online_dict = {
    "logger_config": {"name": "crafter-cows"},
}
