"""The Conversations API's HTTP adapters (DRF views over responses_api.conversations and the history
store), authenticated like the data plane."""
