"""The report stage and the index page: figures, captions, the attention view and the pages that show them."""
