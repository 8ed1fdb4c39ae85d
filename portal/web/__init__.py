"""The portal's server-rendered pages (templates/web/), login through Django's auth views."""
