"""`hpcrl serve`: a read-only web page of one sweep, live (hpcrl.serve.view reads, hpcrl.serve.page shows)."""
