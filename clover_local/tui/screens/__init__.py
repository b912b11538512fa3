"""Screens of the app: plan, download, launch, chat, and the modal settings, help and conversation pickers."""
