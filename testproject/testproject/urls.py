from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/")),
    path("admin/", admin.site.urls),
    path("weft/api/", include("django_weft.api.urls")),
    path("weft/", include("django_weft.urls")),
]
