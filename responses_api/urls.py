"""The Conversations API's and stored responses' routes (spec 2), included under /v1/ by gateway_project/urls.py. Client
routes (the data plane's keys), so not in the control plane's /openapi.json."""

from __future__ import annotations

from django.urls import path

from responses_api.api.admission import CLIENT_STORE_ROUTES
from responses_api.api.responses_views import ResponseCancelView, ResponseInputItemsView, ResponseView
from responses_api.api.views import ConversationItemsView, ConversationItemView, ConversationsView, ConversationView

__all__ = ["urlpatterns", "app_name"]

# Every route here reads or writes the history store: the namespace puts each under the tenant rate
# limit and the store-outage answer (responses_api/api/admission.py), with nothing to add per route.
app_name = CLIENT_STORE_ROUTES

urlpatterns = [
    path("conversations", ConversationsView.as_view()),
    path("conversations/<str:conversation_id>", ConversationView.as_view()),
    path("conversations/<str:conversation_id>/items", ConversationItemsView.as_view()),
    path("conversations/<str:conversation_id>/items/<str:item_id>", ConversationItemView.as_view()),
    path("responses/<str:response_id>", ResponseView.as_view()),
    path("responses/<str:response_id>/cancel", ResponseCancelView.as_view()),
    path("responses/<str:response_id>/input_items", ResponseInputItemsView.as_view()),
]
