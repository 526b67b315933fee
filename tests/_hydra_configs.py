"""The package's Hydra configs for compose() in tests, registered as the trainer registers them
(the structured schema and the run-id resolver), in one context that is cleared on exit."""
import contextlib


@contextlib.contextmanager
def package_configs():
    from hydra import initialize_config_dir

    from ufp4_megatron.configs import CONFIG_DIR
    from ufp4_megatron.train.identity import register_resolver
    from ufp4_megatron.train.schema import register_configs

    register_configs()
    register_resolver()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        yield
