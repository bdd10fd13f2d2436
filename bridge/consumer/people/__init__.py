"""People in the loop (issue 29): the approval page and its API, and who may use them."""
