"""Job lifecycle on the server side: launching, the queue, the event pump, adoption after a restart."""
