"""The Textual app. It only composes the other steps; nothing outside this package imports textual."""
