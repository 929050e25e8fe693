"""What SpecDesk keeps: chat history, settings, API keys, and where each lives."""
