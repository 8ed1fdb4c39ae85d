from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "PTX Kernel Factory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from factory.compile import configure_cache

        configure_cache(settings.COMPILE_CACHE_DIR)
