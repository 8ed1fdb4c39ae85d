from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
]

# The pages and the API are written alongside; until their url modules exist the project still
# loads (the guard goes once they land).
try:
    urlpatterns.append(path("api/", include("portal.api.urls")))
except ImportError:
    pass
try:
    urlpatterns.append(path("", include("portal.web.urls")))
except ImportError:
    pass

if settings.DEBUG:
    from django.conf.urls.static import static

    urlpatterns += static(settings.MEDIA_URL, document_root=settings.MEDIA_ROOT)
