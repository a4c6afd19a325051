"""Operations: metrics and health, status, operators' queries and actions."""
